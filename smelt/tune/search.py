"""Local search (NeoCPU §3.3.1): the fastest NCHWc schedule per convolution workload, measured.

Tasks. A model is lowered as the compiler would (``layout="propagate"``, no database) and every
NCHWc conv gives a *geometry* (``conv_nchwc.workload`` minus the input block) and the input
block it sees there (its *natural* block). Geometries are deduplicated across models, so a layer
shared by several models is tuned once. Each task also gets *alternate* input blocks (8 and 16
where the channels divide), because a tuned record may change a producer's output block (a
different key for its consumers) and because the global search (``layout_search``) weighs
every (input block, output block) pair.

Search per task, within a time budget (``tune_conv``):
1. the template's default and the cost model's best points first: the first batch is the
   default, the model's best for each other output block, then the model's order
   (``schedule_cost``, wider tiles first on ties);
2. further batches from the model's order while the budget lasts; each batch is ONE library
   (``measure.measure_convs``) and repeats the default, so batches compare through their ratio
   to it (the load of the machine may change between batches);
3. a last batch re-times the default and the winner per output block head to head, at the
   primary and every alternate input block: the winner of many noisy measurements is biased
   fast (winner's curse), so stored times and decisions come from this fresh library.

What is stored (``TuningDB``, target = ``Target.key()``):
- kind ``conv_nchwc`` (``CONV_KIND``), workload ``workload(node, g, ib, threads)``: the best
  schedule for that input block, only if it beats the default by more than ``MARGIN`` (a record
  that only matches the default would just be noise); the layout pass reads these.
- kind ``conv_nchwc_scheme`` (``SCHEME_KIND``), workload + ``{"ob": oc_bn}``: the best schedule
  and its time for every measured (input block, output block) pair, default or not: the global
  search's cost table.
- kind ``layout_transform`` (``TRANSFORM_KIND``), workload ``{n, c, h, w, src, dst, threads}``:
  measured LayoutTransform times for the shapes around the convs (``tune_transforms``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from smelt.codegen.kernels.conv_geometry import ConvGeometry, is_depthwise
from smelt.errors import SmeltError
from smelt.ir.graph import Graph, Node, layout_block
from smelt.schedule.conv import (
    ConvSchedule,
    NchwcSchedule,
    candidate_schedules,
    default_schedule,
    oc_block_choices,
    schedule_cost,
    workload,
)
from smelt.schedule.db import CONV_KIND, SCHEME_KIND, TRANSFORM_KIND, TuningDB, transform_key
from smelt.target import Target, detect
from smelt.tune.measure import (
    ConvShape,
    Entry,
    Transform,
    conv_graph,
    measure_convs,
    measure_transforms,
)

# a tuned schedule must beat the default by this fraction to be stored (measurement noise)
MARGIN = 0.02
BLOCKS = (1, 8, 16)


# ------------------------------------------------------------------------------------------
# Tasks
# ------------------------------------------------------------------------------------------
@dataclass
class ConvTask:
    """One conv geometry to tune, with the input blocks to key records by."""

    geometry: dict  # workload(...) without "ib"
    ibs: list[int]  # the first is the primary (most frequent natural block), then the rest
    models: list[str] = field(default_factory=list)
    uses: int = 1

    @property
    def shape(self) -> ConvShape:
        return ConvShape.from_workload(self.geometry)

    @property
    def threads(self) -> int:
        return int(self.geometry["threads"])

    def key(self, ib: int) -> dict:
        return {**self.geometry, "ib": ib}

    def describe(self) -> str:
        s = self.shape
        oh, ow = s.out_hw
        dw = "dw " if s.group == s.c == s.oc and s.group > 1 else (f"g{s.group} " if s.group > 1 else "")
        return (f"{dw}{s.c}->{s.oc} {s.kh}x{s.kw}/{s.sh} {s.h}x{s.w}->{oh}x{ow}"
                + (f" n{s.n}" if s.n > 1 else ""))


def _input_blocks(geo: ConvGeometry, natural: Iterable[int], target: Target) -> list[int]:
    """Natural blocks (most frequent first), then the other blocks a producer could give."""
    nat = list(dict.fromkeys(natural))
    alts = []
    if any(b > 1 for b in nat):  # a plain-fed conv (the stem) stays plain-fed
        cg = geo.cg if geo.group > 1 and not is_depthwise(geo) else geo.c
        alts = [b for b in oc_block_choices(geo.c, target) if cg % b == 0]
    return nat + [b for b in alts if b not in nat]


def graph_tasks(g: Graph, threads: int, target: Target) -> list[tuple[Node, ConvTask]]:
    """(node, task) per NCHWc conv of a lowered graph (layouts planned), in node order; convs
    that run as Winograd (no direct schedule to tune) are left out."""
    out = []
    for node in g.nodes:
        if node.op != "Conv" or not isinstance(node.schedule, ConvSchedule) or node.schedule.algorithm != "direct":
            continue
        ib = layout_block(g.values[node.inputs[0]].layout)
        geo = ConvGeometry(node, g)
        geom = workload(node, g, ib, threads)
        geom.pop("ib")
        out.append((node, ConvTask(geom, _input_blocks(geo, [ib], target))))
    return out


def collect_tasks(models: Sequence[tuple[str, Graph]], threads: int, target: Target) -> list[ConvTask]:
    """Distinct conv geometries of lowered models (see the module docstring), biggest first."""
    from smelt.schedule.db import canonical

    by_key: dict[str, ConvTask] = {}
    natural: dict[str, list[int]] = {}
    for name, g in models:
        for _node, task in graph_tasks(g, threads, target):
            k = canonical(task.geometry)
            natural.setdefault(k, []).append(task.ibs[0])
            if k in by_key:
                by_key[k].uses += 1
                if name not in by_key[k].models:
                    by_key[k].models.append(name)
            else:
                task.models = [name]
                by_key[k] = task
    for k, task in by_key.items():
        nat = natural[k]
        ordered = sorted(set(nat), key=lambda b: (-nat.count(b), -b))
        g, node = probe(task.shape, ordered[0])
        task.ibs = _input_blocks(ConvGeometry(node, g), ordered, target)
    return sorted(by_key.values(), key=lambda t: -t.shape.flops * t.uses)


def lower_for_tuning(proto, threads: int, target: Target) -> Graph:
    """The graph the compiler would plan by default (propagate mode, database ignored)."""
    from smelt.compiler import lower
    from smelt.options import CompileOptions

    return lower(proto, CompileOptions(threads=threads, layout="propagate", use_tuning_db=False), target)


# ------------------------------------------------------------------------------------------
# Candidates
# ------------------------------------------------------------------------------------------
def probe(shape: ConvShape, ib: int) -> tuple[Graph, Node]:
    """A graph holding one Conv of ``shape`` reading input block ``ib`` (for the schedule space)."""
    g = conv_graph(shape, [(ib, NchwcSchedule(16, 1))])
    return g, g.nodes[0]


def ordered_candidates(node: Node, g: Graph, target: Target) -> tuple[NchwcSchedule, list[NchwcSchedule]]:
    """The default, then every other point: the model's best for each other output block first,
    then by modelled cost (ties: unrolled, wider, fewer oc blocks)."""
    geo = ConvGeometry(node, g)
    default = default_schedule(node, g, target)
    space = [s for s in candidate_schedules(node, g, target) if s != default]
    ow = geo.outs[1]
    if is_depthwise(geo):
        def cost(s: NchwcSchedule) -> tuple:
            return (math.ceil(ow / s.reg_n) * (16 / s.oc_bn), -s.reg_n)
    else:
        def cost(s: NchwcSchedule) -> tuple:
            return (schedule_cost(geo, s), not s.unroll_ker, -s.reg_n, s.oc_blocks)
    space.sort(key=cost)
    firsts = []
    for ob in oc_block_choices(geo.oc, target):
        if ob != default.oc_bn:
            best = next((s for s in space if s.oc_bn == ob), None)
            if best is not None:
                firsts.append(best)
    return default, firsts + [s for s in space if s not in firsts]


# ------------------------------------------------------------------------------------------
# Local search
# ------------------------------------------------------------------------------------------
@dataclass
class TuneResult:
    task: ConvTask
    default: NchwcSchedule
    default_s: float
    best: NchwcSchedule
    best_s: float
    # input block -> output block -> (best schedule, seconds); includes the defaults
    schemes: dict[int, dict[int, tuple[NchwcSchedule, float]]]
    defaults_s: dict[int, float]  # input block -> the default's seconds
    tried: int
    seconds: float
    stored: list[int] = field(default_factory=list)  # input blocks whose record was written

    @property
    def speedup(self) -> float:
        return self.default_s / self.best_s if self.best_s > 0 else 1.0


class CostEstimate:
    """Running estimate of a measurement library's cost: fixed + per entry (mostly gcc)."""

    def __init__(self) -> None:
        self.base, self.per_entry = 0.6, 0.25

    def update(self, entries: int, seconds: float) -> None:
        per = max(0.02, (seconds - self.base) / max(entries, 1))
        self.per_entry = 0.5 * self.per_entry + 0.5 * per

    def cost(self, entries: int) -> float:
        return self.base + self.per_entry * entries

    def fit(self, seconds: float) -> int:
        return int((seconds - self.base) / self.per_entry)


def tune_conv(task: ConvTask, budget_s: float, target: Target | None = None, db: TuningDB | None = None,
              estimate: CostEstimate | None = None, max_batch: int = 24) -> TuneResult:
    """Measure ``task`` within about ``budget_s`` seconds (at least one batch) and store the
    records described in the module docstring into ``db`` (if given)."""
    target = target or detect()
    est = estimate or CostEstimate()
    start = time.perf_counter()
    shape, threads = task.shape, task.threads
    ib0 = task.ibs[0]
    g, node = probe(shape, ib0)
    dw = is_depthwise(ConvGeometry(node, g))
    default, queue = ordered_candidates(node, g, target)

    def ib_of(s: NchwcSchedule, ib: int) -> int:
        return s.oc_bn if dw else ib  # depthwise reads its own block size (the pass converts)

    alt_ibs = [] if dw else task.ibs[1:]
    final_entries = 3 * (1 + len(alt_ibs))  # the last batch: default + winners per input block
    measured: dict[NchwcSchedule, float] = {}
    default_s = 0.0
    first = True
    while True:
        left = budget_s - (time.perf_counter() - start) - est.cost(final_entries)
        n = min(max_batch, est.fit(left) - 1, len(queue))
        if first:
            n = max(n, min(2, len(queue)))  # always something besides the default
        elif n < 2:
            break
        batch = [default] + queue[:n]
        queue = queue[n:]
        t0 = time.perf_counter()
        timing = measure_convs(shape, [(ib_of(s, ib0), s) for s in batch], threads, target)
        est.update(len(batch), time.perf_counter() - t0)
        ref = timing.seconds[0]
        if first:
            default_s, first = ref, False
        scale = default_s / ref if ref > 0 else 1.0  # compare batches through the default
        for s, sec in zip(batch[1:], timing.seconds[1:], strict=True):
            measured[s] = sec * scale
        if not queue:
            break
    measured[default] = default_s
    picks: dict[int, NchwcSchedule] = {}  # the search's winner per output block
    for s, sec in measured.items():
        if s.oc_bn not in picks or sec < measured[picks[s.oc_bn]]:
            picks[s.oc_bn] = s
    tried = len(measured)
    # The final batch re-times the default and each winner head to head, at every input block:
    # the winner of many noisy measurements is biased fast (the winner's curse), so what is
    # stored, and what the global search compares, comes from this one fresh library.
    finals = list(dict.fromkeys([default] + list(picks.values())))
    schemes: dict[int, dict[int, tuple[NchwcSchedule, float]]] = {}
    defaults_s: dict[int, float] = {}
    if len(finals) > 1 or alt_ibs:
        entries: list[Entry] = [(ib_of(s, ib), s) for ib in [ib0] + alt_ibs for s in finals]
        t0 = time.perf_counter()
        timing = measure_convs(shape, entries, threads, target)
        est.update(len(entries), time.perf_counter() - t0)
        tried += len(entries) - len(finals)
        keyed = [ib for ib in [ib0] + alt_ibs for _ in finals]
        for ib, (_, s), sec in zip(keyed, entries, timing.seconds, strict=True):
            if s == default:
                defaults_s[ib] = sec
            cur = schemes.setdefault(ib, {}).get(s.oc_bn)
            if cur is None or sec < cur[1]:
                schemes[ib][s.oc_bn] = (s, sec)
        default_s = defaults_s[ib0]
    else:
        schemes[ib0], defaults_s[ib0] = {default.oc_bn: (default, default_s)}, default_s
    if dw:  # the input block does not change a depthwise kernel: same numbers for every key
        for ib in task.ibs[1:]:
            schemes[ib], defaults_s[ib] = dict(schemes[ib0]), default_s
    best, best_s = min((v for v in schemes[ib0].values()), key=lambda v: v[1])
    result = TuneResult(task, default, default_s, best, best_s, schemes, defaults_s, tried,
                        time.perf_counter() - start)
    if db is not None:
        store(result, db, target)
    return result


def store(result: TuneResult, db: TuningDB, target: Target) -> None:
    """Write ``result``'s records (see the module docstring)."""
    tk = target.key()
    for ib, per_ob in result.schemes.items():
        key = result.task.key(ib)
        for ob, (s, sec) in per_ob.items():
            db.store(SCHEME_KIND, {**key, "ob": ob}, tk, s.to_dict(), sec, result.tried)
        s, sec = min(per_ob.values(), key=lambda v: v[1])
        if sec < result.defaults_s.get(ib, math.inf) * (1 - MARGIN):
            db.store(CONV_KIND, key, tk, s.to_dict(), sec, result.tried)
            result.stored.append(ib)


# ------------------------------------------------------------------------------------------
# Layout transforms
# ------------------------------------------------------------------------------------------
def transform_items(tasks: Iterable[ConvTask], target: Target) -> list[Transform]:
    """Every transform the global search may price: between blocks 1/8/16 (those dividing C) of
    the tensors that convs read and write."""
    shapes = set()
    for t in tasks:
        s = t.shape
        oh, ow = s.out_hw
        shapes.add((s.n, s.c, s.h, s.w))
        shapes.add((s.n, s.oc, oh, ow))
    items = []
    for n, c, h, w in sorted(shapes):
        ok = [b for b in BLOCKS if c % b == 0 and (b == 1 or b in oc_block_choices(c, target))]
        items += [(n, c, h, w, a, b) for a in ok for b in ok if a != b]
    return items


def tune_transforms(items: Sequence[Transform], threads: int, target: Target | None = None,
                    db: TuningDB | None = None) -> list[float]:
    """Measure every transform item and store it (kind ``TRANSFORM_KIND``)."""
    target = target or detect()
    if not items:
        return []
    secs = measure_transforms(items, threads, target)
    if db is not None:
        for (n, c, h, w, a, b), sec in zip(items, secs, strict=True):
            db.store(TRANSFORM_KIND, transform_key(n, c, h, w, a, b, threads), target.key(), {}, max(sec, 1e-9))
    return secs


# ------------------------------------------------------------------------------------------
# A whole tuning run
# ------------------------------------------------------------------------------------------
@dataclass
class TuneReport:
    results: list[TuneResult]
    skipped: list[ConvTask]
    transforms: int
    seconds: float
    failed: list[tuple[ConvTask, str]] = field(default_factory=list)  # (task, error): a smelt bug


def tune_tasks(tasks: Sequence[ConvTask], budget_s: float, threads: int, target: Target | None = None,
               db: TuningDB | None = None, transforms: bool = True,
               on_task: Callable[[int, TuneResult | None], None] | None = None,
               progress: bool = False) -> TuneReport:
    """Tune every task within ``budget_s`` seconds overall: the transforms first (a small,
    bounded share), then the convs, each getting an equal share of what is left (time a task
    does not use rolls over to the next). Tasks that no longer fit are skipped and reported.
    ``progress``: a line for the transforms and a bar over the tasks on stderr."""
    from smelt.progress import counter, stage

    target = target or detect()
    start = time.perf_counter()
    n_tr = 0
    if transforms:
        items = transform_items(tasks, target)
        # about 0.05 s of gcc per transform: skip them if they would eat over a tenth of the budget
        if items and 0.05 * len(items) + 1.0 <= 0.1 * budget_s:
            with stage(f"measuring {len(items)} layout transforms", enabled=progress):
                tune_transforms(items, threads, target, db)
            n_tr = len(items)
    tick = counter("tuning conv workloads", len(tasks), enabled=progress)
    est = CostEstimate()
    results: list[TuneResult] = []
    skipped: list[ConvTask] = []
    failed: list[tuple[ConvTask, str]] = []
    for i, task in enumerate(tasks):
        left = budget_s - (time.perf_counter() - start)
        share = left / (len(tasks) - i)
        if left < est.cost(3):  # not even a default and two candidates: stop here
            skipped.extend(tasks[i:])
            for j in range(i, len(tasks)):
                tick(j)
                if on_task:
                    on_task(j, None)
            break
        try:
            res: TuneResult | None = tune_conv(task, share, target, db, est)
        except (RuntimeError, ValueError, SmeltError) as exc:  # one bad workload must not end the run
            failed.append((task, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
            res = None
        if res is not None:
            results.append(res)
        tick(i)
        if on_task:
            on_task(i, res)
    return TuneReport(results, skipped, n_tr, time.perf_counter() - start, failed)
