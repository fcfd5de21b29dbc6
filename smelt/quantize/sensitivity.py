"""Per-node sensitivity on one compiled model: which quantized node hurts the output most.

The accuracy loop's first ranking (``accuracy.added_noise``: the noise a node adds relative to
its own tensor's signal) misjudges networks with residual streams: a residual branch's output is
small beside the stream it is added to, so its relative noise says little about the output's.
What matters is each node's contribution at the output, and that is measured here directly.

``SwitchModel`` rewrites the fully quantized QDQ model into one float model where each node's
quantization is a switch: its weights are ``W + m_node * (DQ(W_q) - W)`` and each activation
``t + m_t * (DQ(Q(t)) - t)`` (the writer's Clip included), the ``m`` scalar graph inputs. It is
compiled once by smelt; every configuration (which nodes are float) is then a run with other
switch values: all 0 is the float model (the reference, same kernels), a single node on gives
that node's own contribution. The quantization is simulated in float here (DQ of the same codes;
only the integer kernels' accumulation order and requantization rounding differ, far below the
quantization noise), so the loop confirms each configuration it settles on with the real integer
kernels (``accuracy.keep_until_bound``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from smelt.quantize.numeric import TensorError, qdq_pairs


def _switch(quantized: str, exact: str, mask: str) -> list[onnx.NodeProto]:
    """``exact + mask * (quantized - exact)`` as Sub, Mul, Add."""
    return [helper.make_node("Sub", [quantized, exact], [f"{quantized}__delta"]),
            helper.make_node("Mul", [mask, f"{quantized}__delta"], [f"{quantized}__scaled"]),
            helper.make_node("Add", [exact, f"{quantized}__scaled"], [f"{quantized}__switched"])]


class SwitchModel:
    """The switchable simulation of ``quantized`` (static QDQ, every candidate node quantized).
    ``float_weights``: per node, its weight as the QDQ model's weight DQ approximates it (alpha
    folded for a Gemm); ``node_acts``: per node, the activation tensors it quantizes."""

    def __init__(self, quantized: onnx.ModelProto, float_weights: Mapping[str, np.ndarray],
                 node_acts: Mapping[str, tuple[str, ...]], feeds: list[dict[str, np.ndarray]],
                 make: Callable[[onnx.ModelProto], object]) -> None:
        sim = onnx.ModelProto()
        sim.CopyFrom(quantized)
        g = sim.graph
        pairs = {dq: f for f, _, dq in qdq_pairs(sim)}  # dequantized activation -> float tensor
        self.acts = sorted(set(pairs.values()))
        self.nodes = sorted(float_weights)
        switch = {f"node:{n}": f"qswitch_node_{k}" for k, n in enumerate(self.nodes)}
        switch |= {f"act:{t}": f"qswitch_act_{k}" for k, t in enumerate(self.acts)}
        self._switch = switch
        groups: list[list[onnx.NodeProto]] = []  # each switch: Sub, Mul, Add
        replace: dict[str, str] = {}
        for dq, f in pairs.items():  # t + m * (DQ(Q(t)) - t)
            groups.append(_switch(dq, f, switch[f"act:{f}"]))
            replace[dq] = f"{dq}__switched"
        for n in self.nodes:  # W + m * (DQ(W_q) - W): the delta folds to one constant
            w_dq, w_f = f"{n}_W_dq", f"{n}__W_float"
            g.initializer.append(numpy_helper.from_array(np.asarray(float_weights[n], np.float32), w_f))
            groups.append(_switch(w_dq, w_f, switch[f"node:{n}"]))
            replace[w_dq] = f"{w_dq}__switched"
        producers = {o: k for k, node in enumerate(g.node) for o in node.output}
        after: dict[int, list[onnx.NodeProto]] = {}
        for group in groups:  # each switch right after the last producer of what it reads
            at = max((producers[i] for i in group[0].input if i in producers), default=-1)
            after.setdefault(at, []).extend(group)
        ordered = list(after.get(-1, []))
        for k, node in enumerate(g.node):
            node.input[:] = [replace.get(i, i) for i in node.input]
            ordered.append(node)
            ordered += after.get(k, [])
        del g.node[:]
        g.node.extend(ordered)
        g.input.extend(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, []) for name in switch.values())
        self._outputs = [o.name for o in g.output]
        self._node_acts = {n: tuple(t for t in node_acts[n] if t in self.acts) for n in self.nodes}
        shapes = {k: list(np.shape(v)) for k, v in feeds[0].items()} | {name: [] for name in switch.values()}
        self._model = make(sim)
        self._shapes = shapes
        self._feeds = feeds
        self._reference = self._run(set())

    def _run(self, quantized: set[str]) -> list[list[np.ndarray]]:
        acts = {t for n in quantized for t in self._node_acts[n]}
        values = {name: np.array(0.0, np.float32) for name in self._switch.values()}
        for n in quantized:
            values[self._switch[f"node:{n}"]] = np.array(1.0, np.float32)
        for t in acts:
            values[self._switch[f"act:{t}"]] = np.array(1.0, np.float32)
        return [list(self._model.run_graph(feed | values)) for feed in self._feeds]  # type: ignore[attr-defined]

    def errors(self, quantized: set[str]) -> list[TensorError]:
        """Each model output's error against float with ``quantized`` nodes quantized, over the
        feeds (the debug table's measures)."""
        got = self._run(quantized)
        out = []
        for k, name in enumerate(self._outputs):
            ref = [np.asarray(r[k], np.float64) for r in self._reference]
            val = [np.asarray(v[k], np.float64) for v in got]
            s_ref = sum(float(np.sum(r * r)) for r in ref)
            s_err = sum(float(np.sum((r - v) ** 2)) for r, v in zip(ref, val, strict=True))
            mx = max(float(np.abs(r - v).max()) if r.size else 0.0 for r, v in zip(ref, val, strict=True))
            count = sum(r.size for r in ref)
            sqnr = float("inf") if s_err == 0 else float(10 * np.log10(max(s_ref, 1e-300) / s_err))
            peak = max(float(np.abs(r).max()) if r.size else 0.0 for r in ref)
            mean = sum(float(np.abs(r - v).sum()) for r, v in zip(ref, val, strict=True)) / max(count, 1)
            out.append(TensorError(name, mx, mean, sqnr, 0, count, peak))
        return out

    def contributions(self) -> dict[str, float]:
        """Per node, the output noise-to-signal power with that node alone quantized (summed
        over outputs): its own harm at the output."""
        return {n: sum(10 ** (-t.sqnr_db / 10) if np.isfinite(t.sqnr_db) else 0.0 for t in self.errors({n}))
                for n in self.nodes}

    def close(self) -> None:
        self._model.close()  # type: ignore[attr-defined]
