"""An ONNX LSTM / GRU / RNN node as the recurrent kernels see it (``RnnConfig``: sizes, gates,
activations, input and output names), read and checked once; shared by the RNN template
(smelt/codegen/templates/rnn/) and its schedule (smelt/schedule/rnn.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smelt.ir.activations import RNN_ACTIVATIONS
from smelt.ir.graph import Graph, Node

VL = 16  # floats per vector (AVX-512); the packing unit of hidden blocks
ACC_BUDGET = 24  # accumulator registers a recurrence tile may use
# A thread's rows up to this many share each R load (gate-split passes, R streamed from L3). A
# C microbenchmark of the H=1024 step (2 threads, per-thread 8 MB R slice): 10 rows x 2 gates
# 0.29-0.35 ms vs row chunks 0.41; 20 rows x 1 gate 0.69-0.76 vs 0.66 (load-port bound).
GATE_SPLIT_ROWS = 12
REC_GROUP_ROWS = 24  # batch rows whose accumulators share one pass over an L1 block of R

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"], "RNN": ["tanh"]}
# activation -> (takes alpha, takes beta) and its defaults: smelt.ir.activations.RNN_ACTIVATIONS
ACT_ARGS = {k: (a.alpha is not None, a.beta is not None) for k, a in RNN_ACTIVATIONS.items()}
ACT_DEFAULTS = {k: (a.alpha or 0.0, a.beta or 0.0) for k, a in RNN_ACTIVATIONS.items()}


@dataclass
class RnnConfig:
    op: str
    G: int
    T: int
    B: int
    E: int  # input size
    H: int
    D: int
    layout: int
    reverse: tuple[bool, ...]
    acts: list[list[tuple[str, float, float]]]  # per direction: (name, alpha, beta) per slot
    clip: float | None
    input_forget: bool
    lbr: bool  # GRU linear_before_reset
    x: str
    w: str
    r: str
    b: str
    seq: str
    h0: str
    c0: str
    p: str
    y: str
    yh: str
    yc: str
    rgm: bool = False  # R packed gate-major per hidden block ([g][H][16]); else [H][G*16]
    two_parts: bool = False  # a thread's R slice stays in L2: gate-split passes in two row parts too
    acc_budget: int = ACC_BUDGET  # logical-vector accumulators of a register tile (the target's; RnnVecIsa)

    @property
    def Hp(self) -> int:  # noqa: N802
        return -(-self.H // VL) * VL

    @property
    def nhb(self) -> int:
        return self.Hp // VL

    @property
    def ntot(self) -> int:
        return self.D * self.G * self.Hp


def _inp(node: Node, i: int) -> str:
    return node.inputs[i] if len(node.inputs) > i else ""


def _out(node: Node, i: int) -> str:
    return node.outputs[i] if len(node.outputs) > i else ""


def _parse_acts(op: str, D: int, node: Node) -> tuple[list[list[tuple[str, float, float]]] | None, str]:
    names = node.attr("activations")
    n = len(DEFAULT_ACTS[op])
    if names is None:
        names = DEFAULT_ACTS[op] * D
    names = [str(s).lower() for s in names]
    if len(names) != n * D:  # onnxruntime rejects this too (no implicit repeat per direction)
        return None, f"{op} needs {n * D} activations, given {len(names)}"
    alphas = [float(a) for a in (node.attr("activation_alpha") or [])]
    betas = [float(b) for b in (node.attr("activation_beta") or [])]
    ai, bi = iter(alphas), iter(betas)
    out: list[tuple[str, float, float]] = []
    for name in names:
        if name not in ACT_ARGS:
            return None, f"unknown {op} activation {name!r}"
        takes_a, takes_b = ACT_ARGS[name]
        da, db = ACT_DEFAULTS.get(name, (0.0, 0.0))
        a = next(ai, da) if takes_a else 0.0
        b = next(bi, db) if takes_b else 0.0
        out.append((name, float(np.float32(a)), float(np.float32(b))))
    return [out[d * n:(d + 1) * n] for d in range(D)], ""


def _dt(g: Graph, name: str) -> str | None:
    v = g.values[name]
    return None if v.dtype is None else np.dtype(v.dtype).name


def config(node: Node, g: Graph) -> tuple[RnnConfig | None, str]:
    op = node.op
    G = GATES[op]
    x, w, r = _inp(node, 0), _inp(node, 1), _inp(node, 2)
    if not (x and w and r):
        return None, f"{op} needs X, W and R"
    for name in [i for i in node.inputs if i] + [o for o in node.outputs if o]:
        if name == _inp(node, 4):
            if _dt(g, name) != "int32":
                return None, f"{op} sequence_lens must be int32"
        elif _dt(g, name) != "float32":
            return None, f"native {op} is float32 only ({name!r} is {_dt(g, name)})"
    layout = int(node.attr("layout", 0))
    if layout not in (0, 1):
        return None, f"{op} layout {layout} is not 0 or 1"
    xs, ws, rs = g.values[x].shape, g.values[w].shape, g.values[r].shape
    if xs is None or ws is None or rs is None:
        return None, f"{op} X, W and R need static shapes (X {xs}, W {ws}, R {rs})"
    if len(xs) != 3 or len(ws) != 3 or len(rs) != 3:
        return None, f"{op} expects rank-3 X, W, R"
    if not all(isinstance(d, int) for d in (*xs, *ws, *rs)):
        # a sequence length the data decides (frames expanded by predicted durations)
        return None, f"{op} X {list(xs)} has a dimension only the run decides"
    T, B = (xs[0], xs[1]) if layout == 0 else (xs[1], xs[0])
    E, D, H = xs[2], ws[0], rs[2]
    direction = str(node.attr("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        return None, f"unknown {op} direction {direction!r}"
    if D != (2 if direction == "bidirectional" else 1):
        return None, f"{op} W has {D} directions, direction is {direction}"
    if tuple(ws) != (D, G * H, E) or tuple(rs) != (D, G * H, H):
        return None, f"{op} W/R shapes {ws}/{rs} do not match X {xs} and hidden size {H}"
    if node.attr("hidden_size") is not None and int(node.attr("hidden_size")) != H:
        return None, f"{op} hidden_size attribute disagrees with R"
    if T <= 0 or B <= 0 or H <= 0 or E <= 0:
        return None, f"{op} with an empty dimension (T={T}, B={B}, E={E}, H={H})"
    bias, seq, h0 = _inp(node, 3), _inp(node, 4), _inp(node, 5)
    c0 = _inp(node, 6) if op == "LSTM" else ""
    p = _inp(node, 7) if op == "LSTM" else ""
    if bias and tuple(g.values[bias].shape) != (D, 2 * G * H):
        return None, f"{op} B has shape {g.values[bias].shape}"
    if seq and tuple(g.values[seq].shape) != (B,):
        return None, f"{op} sequence_lens has shape {g.values[seq].shape}"
    sshape = (D, B, H) if layout == 0 else (B, D, H)
    for name in (h0, c0):
        if name and tuple(g.values[name].shape) != sshape:
            return None, f"{op} initial state {name!r} has shape {g.values[name].shape}, expected {sshape}"
    if p and tuple(g.values[p].shape) != (D, 3 * H):
        return None, f"{op} P has shape {g.values[p].shape}"
    if seq and g.values[seq].const is not None and bool(np.all(g.values[seq].const == T)):
        seq = ""  # every sequence is full length: no masks needed
    acts, why = _parse_acts(op, D, node)
    if acts is None:
        return None, why
    clip = node.attr("clip")
    clip = None if clip is None else float(np.float32(clip))
    if clip is not None and not clip > 0:
        return None, f"{op} clip must be positive"
    input_forget = bool(node.attr("input_forget", 0)) if op == "LSTM" else False
    lbr = bool(node.attr("linear_before_reset", 0)) if op == "GRU" else False
    reverse = (direction == "reverse",) if D == 1 else (False, True)
    cfg = RnnConfig(op, G, int(T), int(B), int(E), int(H), int(D), layout, reverse, acts, clip, input_forget, lbr,
                    x, w, r, bias, seq, h0, c0, p, _out(node, 0), _out(node, 1),
                    _out(node, 2) if op == "LSTM" else "")
    return cfg, ""


def gate_split_rows(budget: int) -> int:
    """Most rows of a gate-split pass: GATE_SPLIT_ROWS, and at least one gate's accumulator per
    row must fit the register budget (AVX2's 6: a 10-row pass spilled every FMA)."""
    return min(GATE_SPLIT_ROWS, budget)


def gate_split_parts(rows: int, ng: int, budget: int, two: bool = True) -> list[int]:
    """The row parts a thread's ``rows`` run as gate-split passes over ``ng`` gates (R packed
    gate-major), or [] for row-chunk tiles. One part: above one register tile and at most
    ``gate_split_rows``. Two balanced parts, each above one register tile, up to twice that, when
    a part's pass still covers two gates or more: each R load then feeds 10-12 rows' FMAs and
    the accumulators stay in registers over the whole K, where the row chunks of 5 reloaded them
    every K block (AVX-512, LSTM H=256, a thread's 20 rows x 8 hidden blocks, 1-thread C harness
    of the cell, 3 paired runs: 5.22-5.34 vs 5.32-5.47 ms per 100 steps). Only with ``two``: the
    schedule's word that the thread's R slice stays in L2 (the parts read it twice a step; from
    L3 that doubles the stream the row chunks' K blocking shares). With one gate per pass
    (AVX2's 6 accumulators) the parts would read R 2G times a step: not taken."""
    tile, most = tile_rows(ng, budget), gate_split_rows(budget)
    if tile < rows <= most:
        return [rows]
    first = -(-rows // 2)
    if two and most < rows <= 2 * most and rows - first > tile and budget // first >= 2 and ng >= 2:
        return [first, rows - first]
    return []


def tile_rows(ng: int, budget: int) -> int:
    """Most batch rows of one recurrence register tile computing ``ng`` gates."""
    return max(1, min(8, budget // ng))
