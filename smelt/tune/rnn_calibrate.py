"""Calibration of recurrent schedules (DeepCPU sec. 5.4): measure, don't guess.

DeepCPU prunes the schedule space analytically (PCP picks the partition for each parallelism
degree) and then calibrates empirically over the parallelism degree. smelt's recurrence grid
(``xi`` batch-row groups x ``xj`` hidden-unit groups per direction group, see
``smelt.schedule.rnn``) is chosen by the data-movement model by default; this module
times every grid with ``xi * xj <= p`` (so also fewer threads than the group has: the
parallelism degree) for each recurrent node of a model, and stores the fastest in the tuning
database (kind ``"rnn"``, workload = ``rnn_workload``). Later compiles of the same workload on
the same target use it.

    python -m smelt.tune.rnn_calibrate zoo:lstm-E256-H256-B10-T100 [--threads 2] [--rounds 15]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from smelt.codegen.kernels.rnn_config import GATES, VL
from smelt.schedule.rnn import RNN_KIND, annotate


@dataclass(frozen=True)
class Calibration:
    node: str
    workload: dict
    timings: dict[tuple[int, int], float]  # grid -> seconds per call (median of per-round minima)
    best: tuple[int, int]
    stored: bool


def _node_model(model: onnx.ModelProto, node: onnx.NodeProto, shapes: dict[str, list[int]]) -> onnx.ModelProto:
    """A one-node model: the recurrent node with its constant inputs, other inputs as graph inputs."""
    inits = {t.name: t for t in model.graph.initializer}
    g_inputs, g_inits = [], []
    elem = {n: onnx.TensorProto.INT32 if i == 4 else onnx.TensorProto.FLOAT for i, n in enumerate(node.input)}
    for name in node.input:
        if not name:
            continue
        if name in inits:
            g_inits.append(inits[name])
        else:
            g_inputs.append(helper.make_tensor_value_info(name, elem[name], shapes[name]))
    outs = [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in node.output if o]
    graph = helper.make_graph([node], f"calib_{node.op_type}", g_inputs, outs, g_inits)
    m = helper.make_model(graph, opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    return m


def _workload(node: onnx.NodeProto, shapes: dict[str, list[int]], p: int) -> dict:
    """``smelt.schedule.rnn.rnn_workload`` of this node, from the ONNX side."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    layout = int(attrs.get("layout", 0))
    xs = shapes[node.input[0]]
    T, B = (xs[0], xs[1]) if layout == 0 else (xs[1], xs[0])
    direction = attrs.get("direction", b"forward")
    D = 2 if (direction.decode() if isinstance(direction, bytes) else direction) == "bidirectional" else 1
    H = int(attrs["hidden_size"])
    lbr = int(attrs.get("linear_before_reset", 0)) if node.op_type == "GRU" else 0
    return {"op": node.op_type, "E": int(xs[2]), "H": H, "B": int(B), "T": int(T), "D": D, "lbr": lbr,
            "threads": p}


def _time(models: dict, feeds: dict, rounds: int) -> dict:
    """Seconds per call of each compiled model, interleaved round by round (see the end)."""
    per: dict = {k: [] for k in models}
    for cm in models.values():  # warm-up
        for _ in range(3):
            cm.run(feeds)
    for r in range(rounds):
        keys = list(models)
        keys = keys[r % len(keys):] + keys[:r % len(keys)]  # rotate the starting variant
        for k in keys:
            time.sleep(0.02)  # let the previous variant's spinning workers stop
            models[k].run(feeds)
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                models[k].run(feeds)
                best = min(best, time.perf_counter() - t0)
            per[k].append(best)
    # median over rounds of each round's fastest call: on a shared machine a call that lost its
    # core to another process is an outlier, not a property of the schedule
    return {k: float(np.median(v)) for k, v in per.items()}


def calibrate(model: onnx.ModelProto, threads: int = 0, rounds: int = 15, store: bool = True,
              seed: int = 0) -> list[Calibration]:
    """Time every recurrence grid of every LSTM/GRU/RNN node of ``model`` (static shapes) at
    ``threads`` threads; store the fastest per workload in the tuning database."""
    import smelt
    from smelt.schedule.db import open_default
    from smelt.target import detect

    target = detect()
    threads = threads or target.physical_cores
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes: dict[str, list[int]] = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in vi.type.tensor_type.shape.dim]
        shapes[vi.name] = dims
    db = open_default() if store else None
    rng = np.random.default_rng(seed)
    results = []
    done: set[str] = set()
    for node in model.graph.node:
        if node.op_type not in GATES:
            continue
        xs = shapes.get(node.input[0], [])
        if len(xs) != 3 or 0 in xs:
            raise ValueError(f"node {node.name!r}: calibration needs static shapes, X is {xs}")
        wl = _workload(node, shapes, 0)
        p = threads if wl["D"] == 1 else max(1, threads // 2)  # threads of one direction group
        wl["threads"] = p
        key = repr(sorted(wl.items()))
        if key in done:
            continue
        done.add(key)
        sub = _node_model(model, node, shapes)
        nhb = -(-wl["H"] // VL)
        grids = [(xi, xj) for xi in range(1, min(p, wl["B"]) + 1) for xj in range(1, min(p // xi, nhb) + 1)]
        compiled = {gr: smelt.compile(annotate(sub, grid=gr), threads=threads) for gr in grids}
        feeds = {}
        for vi in sub.graph.input:
            dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            if vi.type.tensor_type.elem_type == onnx.TensorProto.INT32:  # sequence_lens: full length
                feeds[vi.name] = np.full(dims, wl["T"], np.int32)
            else:
                feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
        timings = _time(compiled, feeds, rounds)
        for cm in compiled.values():
            cm.close()
        best = min(timings, key=timings.get)
        stored = bool(db is not None and db.store(RNN_KIND, wl, target.key(), {"xi": best[0], "xj": best[1]},
                                                  timings[best], tried=len(grids)))
        results.append(Calibration(node.name, wl, timings, best, stored))
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="an .onnx path or a zoo name (zoo:lstm-E256-H256-B10-T100)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dry-run", action="store_true", help="measure only, store nothing")
    args = ap.parse_args(argv)
    from smelt.frontend.zoo import load_model_or_zoo

    for spec in args.models:
        proto, display, _ = load_model_or_zoo(spec)
        for c in calibrate(proto, args.threads, args.rounds, store=not args.dry_run):
            times = ", ".join(f"{xi}x{xj}: {t * 1e3:.3f} ms" for (xi, xj), t in sorted(c.timings.items()))
            print(f"{display} {c.node}: {times}; best {c.best[0]}x{c.best[1]}"
                  + (" (stored)" if c.stored else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
