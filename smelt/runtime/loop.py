"""A Loop node whose trip count or condition is only known at run time, run with its body compiled.

``passes/unroll_loops.py`` unrolls a Loop whose trip count and condition are constants. Any other
Loop (a decoder that stops at an end token: SLANet's 500-step attention-GRU) stays a fallback step,
and onnx.reference then ran its body op by op in numpy, every iteration: ~20 s a call. Here the
body becomes a model of its own, compiled by smelt like any other (its Loop-invariant weights as
constants, so they are prepacked), and this driver runs it iteration by iteration with the Loop's
semantics (``runtime/reference_ops.Loop``, the oracle):

- body inputs: (iteration number, condition, carried values...), then the outer values it reads;
  body outputs: (condition, carried values..., scan outputs...);
- iterate while the condition holds (true when the node has none) and, when the node has a trip
  count M, while the iteration number is below M; the next condition is the body's;
- the node's outputs: the last carried values, then each scan output stacked on a new axis 0.

A carried value the body passes through unchanged (output named as its input) is Loop-invariant:
it leaves the body's inputs and outputs (fed once as a constant when it is one, else per call).
Zero iterations give the initial values and empty scan outputs of the body's declared shapes
(onnxruntime's answer; onnx.reference fails there). A Loop whose carried shapes keep changing (each
new shape would be one more compiled variant), whose body does not compile, or that carries
sequences or optionals, is run by the reference instead, for the call and from then on.
The loop control is Python (one native call per iteration plus the feed dictionary); the numpy it
uses is the glue of a fallback step (stacking the scan outputs), not arithmetic of the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx
from onnx import helper, numpy_helper

from smelt.errors import SmeltError
from smelt.ir.subgraphs import outer_names

# distinct body input signatures one Loop may compile before the reference takes over (a carried
# value that grows every iteration would otherwise compile a variant per iteration)
MAX_BODY_SHAPES = 4


class BodyModel(Protocol):
    """What the driver needs of a compiled body (``smelt.api.CompiledModel``)."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]: ...

    @property
    def fallback_nodes(self) -> list[str]: ...

    @property
    def native_nodes(self) -> list[tuple[str, str]]: ...


class LoopBody:
    """The body of the one-node Loop model at ``model`` as a standalone ONNX model, and how its
    inputs and outputs map onto the node's."""

    def __init__(self, model: onnx.ModelProto) -> None:
        if len(model.graph.node) != 1 or model.graph.node[0].op_type != "Loop":
            raise ValueError("LoopBody wants a one-node Loop model")
        node = model.graph.node[0]
        self.node = node
        body = next(a.g for a in node.attribute if a.name == "body")
        consts = {t.name: t for t in model.graph.initializer}
        self.trip_count = node.input[0] if len(node.input) > 0 and node.input[0] else None
        self.cond_input = node.input[1] if len(node.input) > 1 and node.input[1] else None
        initial = list(node.input[2:])
        self.n_carried = len(body.input) - 2
        if len(initial) != self.n_carried:
            raise SmeltError(f"Loop {node.name!r}: {len(initial)} initial values for a body of "
                             f"{self.n_carried} carried inputs")
        self.n_scan = len(body.output) - 1 - self.n_carried
        if self.n_scan < 0:
            raise SmeltError(f"Loop {node.name!r}: the body has {len(body.output)} outputs, fewer than "
                             f"the condition and {self.n_carried} carried values")
        self.iter_name, self.cond_name = body.input[0].name, body.input[1].name
        # a scan output of zero iterations: [0, *the body's declared shape], as onnxruntime gives
        scan_vis = list(body.output[1 + self.n_carried:])
        self.scan_empty = [(_static_shape(vi), onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
                           for vi in scan_vis]
        self.iter_shape = _static_shape(body.input[0])
        self.cond_shape = _static_shape(body.input[1])
        carried_in = [i.name for i in body.input[2:]]
        carried_out = [o.name for o in body.output[1:1 + self.n_carried]]
        # Loop-invariant carried values: the body hands them back unchanged
        self.invariant = [j for j in range(self.n_carried) if carried_out[j] == carried_in[j]]
        const_inv = {j for j in self.invariant if initial[j] in consts}
        self.varying = [j for j in range(self.n_carried) if j not in self.invariant]
        self.initial = initial
        self.carried_in = carried_in
        outer = sorted(set().union(*(outer_names(a) for a in node.attribute if a.name == "body")))
        self.outer_inputs = [n for n in outer if n not in consts]
        graph_inputs = {i.name: i for i in model.graph.input}
        missing = [n for n in self.outer_inputs if n not in graph_inputs]
        if missing:
            raise SmeltError(f"Loop {node.name!r}: the body reads {missing[0]!r}, which its model neither "
                             "takes nor holds")
        # the standalone body: the invariant carried values that start as constants, and the outer
        # constants, become its initializers; the rest of the invariant ones are plain inputs
        inits = list(body.initializer)
        for j in sorted(const_inv):
            t = onnx.TensorProto()
            t.CopyFrom(consts[initial[j]])
            t.name = carried_in[j]
            inits.append(t)
        inits += [consts[n] for n in outer if n in consts]
        inputs = [body.input[0], body.input[1]]
        inputs += [body.input[2 + j] for j in range(self.n_carried) if j not in const_inv]
        inputs += [graph_inputs[n] for n in self.outer_inputs]
        outputs = [body.output[0]] + [body.output[1 + j] for j in self.varying] + list(body.output[1 + self.n_carried:])
        graph = helper.make_graph(list(body.node), f"{model.graph.name}_loop_body", inputs, outputs, inits)
        self.model = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
        self.fed_invariant = [j for j in self.invariant if j not in const_inv]
        # sequences and optionals (a Loop building a sequence, SequenceMap's expansion) are not
        # values a compiled body takes: such a Loop stays with the reference
        typed = list(body.input) + list(body.output) + [graph_inputs[n] for n in self.outer_inputs]
        self.tensors_only = all(vi.type.HasField("tensor_type") for vi in typed)
        # the node's inputs held by its model (a constant trip count, constant initial values)
        self.held = {name: numpy_helper.to_array(t) for name, t in consts.items()}

    def value(self, env: Mapping[str, np.ndarray], name: str) -> np.ndarray:
        """One of the node's inputs: from the step's environment or the node's model."""
        return np.asarray(env[name] if name in env else self.held[name])


def _static_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return None if any(d is None for d in dims) else tuple(dims)


class NativeLoopRunner:
    """A fallback step for one Loop node: the body compiled once (per input shape) by
    ``compile_body``, iterated here. ``reference`` runs the whole node the old way (zero
    iterations, shapes that keep changing, a body smelt cannot compile)."""

    def __init__(self, model_path: Path, compile_body: Callable[[onnx.ModelProto], BodyModel],
                 reference: object) -> None:
        self.reference = reference  # a _FallbackRunner (module.py): .run(env)
        self.loop = LoopBody(onnx.load(str(model_path)))
        self._compile_body = compile_body
        self._body: BodyModel | None = None
        self._shapes: set[tuple] = set()
        self.use_reference = not self.loop.tensors_only
        # why the reference runs the node, once it does
        self.reason = "" if self.loop.tensors_only else "the loop carries sequences or optionals"

    def describe(self) -> str:
        """How the node runs, for ``fallback_report``."""
        if self.use_reference:
            return f"onnx.reference runs it: {self.reason}"
        if self._body is None:
            return "its body is compiled by smelt at the first call that iterates"
        native, rest = len(self._body.native_nodes), len(self._body.fallback_nodes)
        return (f"its body runs compiled by smelt ({native} of {native + rest} nodes native), one native "
                "call per iteration")

    def _give_up(self, why: str, env: dict[str, np.ndarray]) -> None:
        self.use_reference, self.reason = True, why
        self.reference.run(env)  # type: ignore[attr-defined]

    def _no_iteration(self, env: dict[str, np.ndarray]) -> None:
        """Zero iterations: the initial values, and empty scan outputs of the body's declared
        shape (the reference when one is not declared)."""
        lp = self.loop
        if any(shape is None for shape, _ in lp.scan_empty):
            self.reference.run(env)  # type: ignore[attr-defined]
            return
        self._write(env, {}, [np.zeros((0, *shape), dtype) for shape, dtype in lp.scan_empty])  # type: ignore[misc]

    def _write(self, env: dict[str, np.ndarray], carried: Mapping[int, np.ndarray],
               scans: Sequence[np.ndarray]) -> None:
        """The node's outputs into ``env``: the last carried values (the initial ones where the
        body left them unchanged), then the scan outputs; unnamed (optional) outputs skipped."""
        lp = self.loop
        names = list(lp.node.output)
        values = [carried[j] if j in carried else lp.value(env, lp.initial[j]) for j in range(lp.n_carried)]
        for name, value in zip(names, [*values, *scans], strict=False):
            if name:
                env[name] = value

    def run(self, env: dict[str, np.ndarray]) -> None:
        if self.use_reference:
            self.reference.run(env)  # type: ignore[attr-defined]
            return
        lp = self.loop
        trip = None if lp.trip_count is None else int(lp.value(env, lp.trip_count).reshape(-1)[0])
        cond = np.array(True) if lp.cond_input is None else lp.value(env, lp.cond_input)
        if not bool(cond.reshape(-1)[0]) or (trip is not None and trip <= 0):
            self._no_iteration(env)
            return
        if any(not isinstance(env.get(n, lp.held.get(n)), np.ndarray) for n in lp.initial + lp.outer_inputs):
            self._give_up("a carried or outer value is not a tensor", env)
            return
        if self._body is None:
            try:
                self._body = self._compile_body(lp.model)
            except SmeltError as err:
                self._give_up(f"the body did not compile: {err}", env)
                return
        iter_dtype = lp.value(env, lp.trip_count).dtype if lp.trip_count is not None else np.dtype(np.int64)
        carried = {j: lp.value(env, lp.initial[j]) for j in lp.varying}
        fixed = {lp.carried_in[j]: lp.value(env, lp.initial[j]) for j in lp.fed_invariant}
        fixed.update({n: lp.value(env, n) for n in lp.outer_inputs})
        scans: list[list[np.ndarray]] = [[] for _ in range(lp.n_scan)]
        i = 0
        while True:
            feeds = dict(fixed)
            feeds[lp.iter_name] = np.array(i, dtype=iter_dtype).reshape(lp.iter_shape or ())
            feeds[lp.cond_name] = cond.astype(np.bool_).reshape(cond.shape if lp.cond_shape is None else lp.cond_shape)
            for j in lp.varying:
                feeds[lp.carried_in[j]] = carried[j]
            sig = tuple((k, v.shape) for k, v in feeds.items())
            if sig not in self._shapes:
                self._shapes.add(sig)
                if len(self._shapes) > MAX_BODY_SHAPES:
                    self._give_up(f"the carried shapes changed more than {MAX_BODY_SHAPES} times", env)
                    return
            outs = self._body.run(feeds)
            cond = np.asarray(outs[0])
            for pos, j in enumerate(lp.varying):
                carried[j] = outs[1 + pos]
            for k in range(lp.n_scan):
                scans[k].append(outs[1 + len(lp.varying) + k])
            i += 1
            if cond.size != 1:
                raise SmeltError(f"Loop {lp.node.name!r}: the body's condition has {cond.size} values, not one")
            if not bool(cond.reshape(-1)[0]) or (trip is not None and i >= trip):
                break
        self._write(env, carried, [np.stack(v, axis=0) for v in scans])
