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

A carried value the body passes through unchanged (output named as its input, or reached from it
by paddle2onnx's assignment Squeeze(Add(Unsqueeze(x), 0)): ``_passes_through``) is Loop-invariant:
it leaves the body's inputs and outputs (fed once as a constant when it is one, else per call).
Work on such values is hoisted (``_hoist``, DeepCPU's hoisting): body nodes reading only
Loop-invariant fed values and constants run once per call in a prologue model, and the body
takes their results as inputs (SLANet's attention keys: a [L, 96] x [96, 256] product per step).
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
        # Loop-invariant carried values: the body hands them back unchanged (paddle2onnx's
        # assignment Squeeze(Add(Unsqueeze(x), 0)) included: ``_passes_through``)
        self.invariant = [j for j in range(self.n_carried)
                          if carried_out[j] == carried_in[j] or _passes_through(body, carried_out[j], carried_in[j])]
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
        # loop-invariant work (DeepCPU's hoisting): nodes that read only the values every
        # iteration sees alike, one of them fed, run once per call in a prologue model whose
        # outputs the body then takes as inputs (SLANet's attention keys, the encoder's features
        # times a weight, were a [L, 96] x [96, 256] product at each of 501 steps)
        self.prologue: onnx.ModelProto | None = None
        self.hoisted: list[str] = []  # the prologue's outputs, fed to every iteration
        self.hoisted_nodes = 0
        varying_names = {carried_in[j] for j in self.varying}
        split = _hoist(self.model, fed={vi.name for vi in inputs[2:] if vi.name not in varying_names})
        if split is not None:
            self.prologue, self.model, self.hoisted, self.hoisted_nodes = split
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


def _constant_of(body: onnx.GraphProto, producers: dict, name: str) -> np.ndarray | None:
    init = next((t for t in body.initializer if t.name == name), None)
    if init is not None:
        return numpy_helper.to_array(init)
    node = producers.get(name)
    if node is not None and node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
        return numpy_helper.to_array(node.attribute[0].t)
    return None


def _passes_through(body: onnx.GraphProto, out: str, src: str) -> bool:
    """Whether body output ``out`` is body input ``src`` unchanged: a chain of Identity, Squeeze
    undoing an Unsqueeze on the same constant axes, and Add/Sub of a constant 0 or Mul/Div by a
    constant 1 (one element; of rank 0, or inside the Unsqueeze, so nothing broadcasts). The
    one thing such a chain changes is a float -0.0 plus 0 becoming +0.0: a carried value that
    passes through it is taken as the same value, which equals it under every comparison."""
    producers = {o: n for n in body.node for o in n.output if o}
    squeezed: list[tuple[int, ...]] = []  # Squeeze axes met walking back, each to be undone
    name = out
    for _ in range(64):
        if name == src:
            return not squeezed
        node = producers.get(name)
        if node is None or node.domain not in ("", "ai.onnx"):
            return False
        ins = list(node.input)
        if node.op_type == "Identity":
            name = ins[0]
        elif node.op_type in ("Squeeze", "Unsqueeze"):
            axes_c = _constant_of(body, producers, ins[1]) if len(ins) > 1 and ins[1] else None
            if axes_c is None:
                attr = next((a for a in node.attribute if a.name == "axes"), None)
                axes_c = np.array(attr.ints) if attr is not None else None
            if axes_c is None:
                return False
            axes = tuple(sorted(int(a) for a in axes_c.reshape(-1)))
            if node.op_type == "Squeeze":
                squeezed.append(axes)
            elif not squeezed or squeezed.pop() != axes or any(a < 0 for a in axes):
                return False
            name = ins[0]
        elif node.op_type in ("Add", "Sub", "Mul", "Div") and len(ins) == 2:
            neutral = 0 if node.op_type in ("Add", "Sub") else 1
            sides = [1] if node.op_type in ("Sub", "Div") else [1, 0]
            for k in sides:
                c = _constant_of(body, producers, ins[k])
                if c is not None and c.size == 1 and (c.ndim == 0 or squeezed) and float(c.reshape(-1)[0]) == neutral:
                    name = ins[1 - k]
                    break
            else:
                return False
        else:
            return False
    return False


# ops whose result is not a function of their inputs: never hoisted out of an iteration
_NOT_PURE = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                       "Bernoulli"})


def _hoist(body: onnx.ModelProto, fed: set[str]) -> tuple[onnx.ModelProto, onnx.ModelProto, list[str], int] | None:
    """Split ``body`` (a standalone body, ``LoopBody.model``) into (a prologue, the body that
    remains, the prologue's outputs, how many nodes moved), or None when no node is worth it.

    A node moves when every input it reads is the same at every iteration (a constant, one of
    ``fed``: the Loop-invariant carried values and outer values, or a moved node's output) and at
    least one is fed: nodes of constants alone stay, since constant folding already computes
    them once and a weight stays a constant the GEMMs prepack. Nodes with subgraphs, random ones,
    and those whose output the body returns stay. The prologue's outputs are the moved values
    the remaining nodes read, typed by onnx's inference (when one cannot be typed, nothing
    moves)."""
    g = body.graph
    constants = {t.name for t in g.initializer}
    outputs = {o.name for o in g.output}
    kind = {name: "const" for name in constants} | {name: "fed" for name in fed}
    moved, const_nodes = [], []
    for node in g.node:
        ins = [i for i in node.input if i]
        if node.op_type in _NOT_PURE or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                           for a in node.attribute):
            continue
        if not all(i in kind for i in ins) or any(o in outputs for o in node.output):
            continue
        k = "fed" if any(kind[i] == "fed" for i in ins) else "const"
        kind.update({o: k for o in node.output if o})
        (moved if k == "fed" else const_nodes).append(node)
    if not moved:
        return None
    moved_ids = {id(n) for n in moved}
    rest = [n for n in g.node if id(n) not in moved_ids]
    made = {o for n in moved for o in n.output if o}
    needed = sorted({i for n in rest for i in n.input if i in made})
    if not needed:
        return None
    try:
        typed = onnx.shape_inference.infer_shapes(body)
    except Exception:  # noqa: BLE001 - onnx's inference raises many kinds; nothing moves then
        return None
    elem = {vi.name: vi.type.tensor_type.elem_type for vi in typed.graph.value_info if vi.type.HasField("tensor_type")}
    if any(not elem.get(n) for n in needed):
        return None
    # the prologue: the moved nodes the needed values come from, and the constant-only nodes
    # they read, in the body's order (a moved node nothing needs was dead in the body: it goes)
    wanted = set(needed)
    candidates = moved_ids | {id(n) for n in const_nodes}
    kept: set[int] = set()
    for node in reversed(g.node):
        if id(node) in candidates and any(o in wanted for o in node.output):
            kept.add(id(node))
            wanted.update(i for i in node.input if i)
    prologue_nodes = [n for n in g.node if id(n) in kept]
    read = {i for n in prologue_nodes for i in n.input if i}
    p_inputs = [vi for vi in g.input if vi.name in read]
    p_inits = [t for t in g.initializer if t.name in read]
    hoisted_vis = [helper.make_tensor_value_info(n, elem[n], None) for n in needed]
    prologue = helper.make_model(
        helper.make_graph(prologue_nodes, f"{g.name}_prologue", p_inputs, hoisted_vis, p_inits),
        opset_imports=list(body.opset_import), ir_version=body.ir_version)
    remaining = helper.make_model(
        helper.make_graph(rest, g.name, list(g.input) + hoisted_vis, list(g.output), list(g.initializer)),
        opset_imports=list(body.opset_import), ir_version=body.ir_version)
    return prologue, remaining, needed, sum(id(n) in moved_ids for n in prologue_nodes)


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
        self._prologue: BodyModel | None = None  # the loop-invariant nodes (``LoopBody.prologue``)
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
        hoisted = (f"; {self.loop.hoisted_nodes} loop-invariant nodes run once per call, before it"
                   if self._prologue is not None else "")
        return (f"its body runs compiled by smelt ({native} of {native + rest} nodes native), one native "
                f"call per iteration{hoisted}")

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
                if lp.prologue is not None:
                    self._prologue = self._compile_body(lp.prologue)
            except SmeltError as err:
                self._give_up(f"the body did not compile: {err}", env)
                return
        iter_dtype = lp.value(env, lp.trip_count).dtype if lp.trip_count is not None else np.dtype(np.int64)
        carried = {j: lp.value(env, lp.initial[j]) for j in lp.varying}
        fixed = {lp.carried_in[j]: lp.value(env, lp.initial[j]) for j in lp.fed_invariant}
        fixed.update({n: lp.value(env, n) for n in lp.outer_inputs})
        if self._prologue is not None:  # the loop-invariant nodes, once for all iterations
            assert lp.prologue is not None
            ins = [vi.name for vi in lp.prologue.graph.input]
            fixed.update(zip(lp.hoisted, self._prologue.run({n: fixed[n] for n in ins}), strict=True))
        scans: list[list[np.ndarray]] = [[] for _ in range(lp.n_scan)]
        # the body's input signature: the fixed inputs' shapes once per call, the varying
        # ones per iteration (a few microseconds a step on a 500-step decoder)
        fixed_sig = tuple((k, v.shape) for k, v in fixed.items())
        feeds = dict(fixed)  # one dict for every iteration: the body reads it during its call only
        i = 0
        while True:
            feeds[lp.iter_name] = np.array(i, dtype=iter_dtype).reshape(lp.iter_shape or ())
            feeds[lp.cond_name] = cond.astype(np.bool_).reshape(cond.shape if lp.cond_shape is None else lp.cond_shape)
            for j in lp.varying:
                feeds[lp.carried_in[j]] = carried[j]
            sig = (fixed_sig, feeds[lp.cond_name].shape, tuple(carried[j].shape for j in lp.varying))
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
