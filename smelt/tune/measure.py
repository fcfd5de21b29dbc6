"""Measuring NCHWc convolution schedules and layout transforms, many per compiled library.

gcc dominates tuning time (a conv kernel takes a fraction of a second to time, a second or more
to compile), so one measurement builds ONE translation unit holding every candidate of a
workload: an IR graph with the workload's input (one graph input per input block, in that
layout: same bytes as plain, the runtime does not care), one Conv node per (input block,
schedule) entry, each writing its own output in its schedule's output layout. The graph skips
the passes (its nodes already carry their layouts and ``node.schedule``) and is planned,
generated and compiled by the ordinary machinery (``compiler.build_lowered``) as an
*instrumented* build, so a single native call runs every entry once and the per-step counters
(``smelt_rt.h``, ``LoadedArtifact.profile_counters``) time each entry separately.

Why that is a fair comparison: every call runs all entries back to back (interleaved by
construction, so a burst of load from another process hits one call's entries alike), each on
all threads with a barrier after it, as in a real model. Each output has its own arena region
(see ``_private_outputs_plan``), touched in the warm-up calls: no page faults inside the timed
region. See ``time_graph`` for the statistic (busy time of the slowest thread, fastest of three
calls, median over rounds) and why.

Entries are split into several libraries when their packed weights and outputs would exceed
``MAX_BYTES`` (each entry packs its own weights and writes its own output, as each conv of a
real model does).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from smelt.codegen.plan import ALIGN, ExecutionPlan, build_plan
from smelt.ir.graph import Graph, Node, Value, blocked_layout
from smelt.schedule.conv import ConvSchedule, NchwcSchedule, forced_direct
from smelt.target import Target, detect

# packed weights + outputs per measurement library (bounds the weights blob and the arena; the
# blob exists in a few copies while it is generated, written and loaded)
MAX_BYTES = 128 << 20
# timing rounds per library (each the fastest of a few calls; see ``time_graph``)
MIN_ROUNDS, MAX_ROUNDS, CALLS_PER_ROUND, MIN_SECONDS = 5, 15, 3, 0.2

Entry = tuple[int, NchwcSchedule]  # (input block, schedule)


@dataclass(frozen=True)
class ConvShape:
    """A conv workload as numbers (``conv_nchwc.workload`` keys, minus the input block)."""

    n: int
    c: int
    h: int
    w: int
    oc: int
    kh: int
    kw: int
    sh: int = 1
    sw: int = 1
    dh: int = 1
    dw: int = 1
    pt: int = 0
    pl: int = 0
    pb: int = 0
    pr: int = 0
    group: int = 1

    @staticmethod
    def from_workload(wl: dict) -> ConvShape:
        fields = ConvShape.__dataclass_fields__
        missing = [k for k in fields if k not in wl and k not in ("sh", "sw", "dh", "dw", "pt", "pl", "pb",
                                                                  "pr", "group")]
        if missing:
            raise ValueError(f"conv workload {wl} lacks {', '.join(missing)}")
        return ConvShape(**{k: int(wl[k]) for k in fields if k in wl})

    @property
    def out_hw(self) -> tuple[int, int]:
        oh = (self.h + self.pt + self.pb - ((self.kh - 1) * self.dh + 1)) // self.sh + 1
        ow = (self.w + self.pl + self.pr - ((self.kw - 1) * self.dw + 1)) // self.sw + 1
        return oh, ow

    @property
    def flops(self) -> int:
        oh, ow = self.out_hw
        return 2 * self.n * self.oc * oh * ow * (self.c // self.group) * self.kh * self.kw


def conv_node(g: Graph, shape: ConvShape, x: str, w: str, b: str, y: str, name: str) -> Node:
    """A Conv node of ``shape`` reading ``x`` into a new value ``y`` (layouts set by the caller)."""
    oh, ow = shape.out_hw
    g.add_value(Value(y, np.dtype(np.float32), (shape.n, shape.oc, oh, ow)))
    attrs = {"kernel_shape": [shape.kh, shape.kw], "strides": [shape.sh, shape.sw],
             "dilations": [shape.dh, shape.dw], "pads": [shape.pt, shape.pl, shape.pb, shape.pr],
             "group": shape.group}
    return Node("Conv", name, [x, w, b], [y], attrs=attrs)


def conv_graph(shape: ConvShape, entries: Sequence[Entry], seed: int = 0) -> Graph:
    """One graph input per input block used, shared weights and bias, one Conv per entry."""
    g = Graph("tune_conv")
    rng = np.random.default_rng(seed)
    w = g.add_const((rng.standard_normal((shape.oc, shape.c // shape.group, shape.kh, shape.kw)) * 0.1)
                    .astype(np.float32), "w")
    b = g.add_const(rng.standard_normal(shape.oc).astype(np.float32), "b")
    for ib in sorted({ib for ib, _ in entries}):
        name = f"x{ib}"
        g.add_value(Value(name, np.dtype(np.float32), (shape.n, shape.c, shape.h, shape.w),
                          layout=blocked_layout(ib)))
        g.inputs.append(name)
    for k, (ib, s) in enumerate(entries):
        node = conv_node(g, shape, f"x{ib}", w, b, f"y{k}", f"cand{k}")
        g.values[f"y{k}"].layout = blocked_layout(s.oc_bn)
        # the direct kernel is what is being measured (a Winograd-eligible shape would otherwise
        # run as Winograd whatever the schedule)
        node.schedule = ConvSchedule("direct", s, "forced")
        g.nodes.append(node)
    return g


Transform = tuple[int, int, int, int, int, int]  # (n, c, h, w, source block, destination block)


def transform_graph(items: Sequence[Transform]) -> Graph:
    """One LayoutTransform per item, each reading its own graph input in the source layout."""
    from smelt.codegen.registry import SMELT_DOMAIN

    g = Graph("tune_transform")
    for k, (n, c, h, w, src, dst) in enumerate(items):
        if c % src or c % dst:
            raise ValueError(f"{c} channels do not divide into blocks {src} -> {dst}")
        g.add_value(Value(f"x{k}", np.dtype(np.float32), (n, c, h, w), layout=blocked_layout(src)))
        g.inputs.append(f"x{k}")
        g.add_value(Value(f"y{k}", np.dtype(np.float32), (n, c, h, w), layout=blocked_layout(dst)))
        g.nodes.append(Node("LayoutTransform", f"transform{k}", [f"x{k}"], [f"y{k}"],
                            attrs={"src": blocked_layout(src), "dst": blocked_layout(dst)}, domain=SMELT_DOMAIN))
    return g


@dataclass
class Timing:
    """Median seconds per entry, and what the measurement cost."""

    seconds: list[float]
    compile_seconds: float
    run_seconds: float
    calls: int


def _private_outputs_plan(g: Graph) -> ExecutionPlan:
    """The ordinary plan, except that every node's output gets its own arena region.

    The planner would put all the (unread) outputs on one region; then an entry writes lines the
    previous entry just wrote in another layout and thread split, still dirty in the other core's
    cache, which made every other entry of a sequence several times slower. Private regions give
    every entry the same conditions: its buffer was last written by itself, a call ago."""
    plan = build_plan(g)
    offsets, total = {}, 0
    for name in plan.arena_offsets:
        offsets[name] = total
        total += -(-g.values[name].nbytes // ALIGN) * ALIGN
    plan.arena_offsets, plan.arena_bytes = offsets, max(total, ALIGN)
    return plan


def time_graph(g: Graph, threads: int, target: Target | None = None, *, min_rounds: int = MIN_ROUNDS,
               max_rounds: int = MAX_ROUNDS, calls_per_round: int = CALLS_PER_ROUND,
               min_seconds: float = MIN_SECONDS) -> Timing:
    """Compile ``g`` (instrumented) and return each node's time: the median over rounds of the
    fastest of ``calls_per_round`` calls, where a call's time of a node is its slowest thread's
    busy time (barrier wait excluded).

    Why busy time and not the step's wall time: on a shared machine a thread that waits at a
    barrier may lose its core, and getting it back takes a scheduler slice (~1 ms), which we saw
    on every other step of a sequence of 50-microsecond transforms. The slowest thread's busy
    time still counts load imbalance, which is what a schedule changes; the barrier itself
    costs the same under every schedule.

    Why not a plain median over calls: other processes share the cores, and their load only ever
    adds time, often for longer than half of a short measurement (then the median of calls is
    the contended time). The minimum of a few consecutive calls drops such bursts; the median
    over rounds drops a lucky outlier.

    The first and last nodes of ``g`` are pacers, not reported: the first step of a native call
    also pays for waking the pool's workers and the last one for the join, so callers put
    duplicates of real entries there."""
    from smelt.compiler import build_lowered
    from smelt.options import CompileOptions
    from smelt.runtime.module import LoadedArtifact

    target = target or detect()
    options = CompileOptions(threads=threads, profile=True, use_tuning_db=False, allow_fallback=False)
    # the graph skipped the schedule stage: each forced tile gets the kernel's other choices
    # (prefetches, work split) as a compile under these options would make them
    for node in g.nodes:
        sched = node.schedule
        if isinstance(sched, ConvSchedule) and sched.tile is not None and sched.direct is None:
            node.schedule = forced_direct(node, g, sched.tile, target, options)
    rng = np.random.default_rng(1)
    feeds = {name: rng.standard_normal(g.values[name].shape).astype(np.float32) for name in g.inputs}
    with tempfile.TemporaryDirectory(prefix="smelt-tune-") as tmp:
        built = build_lowered(g, options, Path(tmp) / "artifact", target=target, plan=_private_outputs_plan(g))
        if built.lib_path is None:
            raise RuntimeError("measurement graph has no native block (a template refused a candidate)")
        art = LoadedArtifact(built.directory, built.lib_path, threads, list(target.core_cpus))
        try:
            start = time.perf_counter()
            for _ in range(2):  # warm-up: pages, caches, the pool's workers spinning
                art.run(feeds)
            rounds: list[np.ndarray] = []
            prev = art.profile_counters()
            t0 = time.perf_counter()
            calls = 0
            while len(rounds) < max_rounds and (len(rounds) < min_rounds or time.perf_counter() - t0 < min_seconds):
                best = None
                for _ in range(calls_per_round):
                    art.run(feeds)
                    cur = art.profile_counters()  # between calls, outside the timed region
                    secs = (cur - prev).busy.max(axis=1)
                    best = secs.copy() if best is None else np.minimum(best, secs)
                    prev = cur
                    calls += 1
                rounds.append(best)
            run_seconds = time.perf_counter() - start
        finally:
            art.close()
    arr = np.array(rounds)  # [rounds, steps]
    per_node: dict[str, float] = {}
    for i, step in enumerate(prev.steps):
        per_node[step.node] = per_node.get(step.node, 0.0) + float(np.median(arr[:, i]))
    seconds = [per_node[n.name] for n in g.nodes[1:-1]]
    return Timing(seconds, built.compile_seconds, run_seconds, calls)


def _chunks(shape: ConvShape, entries: Sequence[Entry]) -> list[list[int]]:
    """Entry indices split so that no library packs more than ``MAX_WEIGHT_BYTES`` of weights."""
    oh, ow = shape.out_hw
    per_entry = shape.oc * (shape.c // shape.group) * shape.kh * shape.kw * 4 + shape.n * shape.oc * oh * ow * 4
    cap = max(1, MAX_BYTES // max(per_entry, 1))
    idx = list(range(len(entries)))
    return [idx[i:i + cap] for i in range(0, len(idx), cap)]


def measure_convs(shape: ConvShape, entries: Sequence[Entry], threads: int, target: Target | None = None,
                  on_compiled: Callable[[], None] | None = None) -> Timing:
    """Median seconds of ``shape`` under each (input block, schedule) entry, in entry order."""
    if not entries:
        raise ValueError("measure_convs needs at least one (input block, schedule) entry")
    seconds = [0.0] * len(entries)
    total = Timing(seconds, 0.0, 0.0, 0)
    for chunk in _chunks(shape, entries):
        # the chunk's first and last entries run twice: the copies are pacers (see ``time_graph``)
        mine = [entries[i] for i in chunk]
        t = time_graph(conv_graph(shape, mine[:1] + mine + mine[-1:]), threads, target)
        for i, s in zip(chunk, t.seconds, strict=True):
            seconds[i] = s
        total.compile_seconds += t.compile_seconds
        total.run_seconds += t.run_seconds
        total.calls += t.calls
        if on_compiled is not None:
            on_compiled()
    return total


def measure_transforms(items: Sequence[Transform], threads: int, target: Target | None = None,
                       per_library: int = 96) -> list[float]:
    """Median seconds of each LayoutTransform item (``per_library`` of them per compiled library)."""
    out: list[float] = []
    for i in range(0, len(items), per_library):
        mine = list(items[i:i + per_library])
        out += time_graph(transform_graph(mine[:1] + mine + mine[-1:]), threads, target).seconds
    return out
